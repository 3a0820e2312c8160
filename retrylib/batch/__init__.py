"""The driver side of a micro-batch: its commit (`commit`) and what it reports and keeps."""
