"""What exists only for GigaTrain 1.1: its helpers (utils), EMAModel, ssh_copy_id, Accelerate's config
forms, giga_datasets data and reading GigaTrain's checkpoints. GigaTrain's import paths re-export them."""
