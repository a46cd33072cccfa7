"""Weight processing: pure functions on a config and a state dict (folding norms, centering,
value-bias folding, attention refactoring) that leave the model's predictions unchanged."""
