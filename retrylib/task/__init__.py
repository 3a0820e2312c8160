"""The executor side of a micro-batch: the tasks that route records and forward delayed ones."""
