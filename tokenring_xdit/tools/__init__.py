"""Tooling around the library: the CLI, the compare job, the attention demo, the launcher,
image metrics and the random-weight pipelines. Nothing in ring/, hosts/ or patches/ imports it."""
