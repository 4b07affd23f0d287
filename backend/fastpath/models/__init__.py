"""Model pipelines, independent of Triton: they turn decoded inputs into outputs with an engine."""
