"""The core, with no torch in it: the IR (graph), the budget grammar, the simulator (the
single judge), the checks and errors, units, device specs and the training state's
arithmetic. Everything else stands on it; it stands on nothing of memplan."""
