"""The command line: `memplan plan | show | solve | maxbatch | solvers | fit`."""
