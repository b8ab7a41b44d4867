"""Tools around the product: the model zoo, the methods memplan is measured against,
checking a plan on its model, the largest-batch search, and reports of plans."""
