"""Worker processes: the template that loads a model once, and the pinned instances forked from it."""
