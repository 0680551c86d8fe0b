"""eval: a candidate checkpoint vs the production baseline on a task suite (issue #7)."""
