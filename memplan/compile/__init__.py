"""The torch.compile path: the backend Dynamo calls, and what it needs of Inductor."""
