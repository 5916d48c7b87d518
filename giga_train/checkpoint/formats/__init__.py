"""The files inside a checkpoint folder: the model layout, weight files, the full-tensor forms every
strategy reads (DCP, DeepSpeed's)."""
