"""Running models bigger than one device or one process (accelerate placement, torch.distributed pipelines)."""
