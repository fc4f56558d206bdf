"""dlrun's Python package, shipped with dlrun: the dlrun agent puts the directory that holds it
on each worker's PYTHONPATH, so a worker imports it without pip.

    import dlrun.progress    # report steps, loss, accuracy and metrics to the agent
    import dlrun.recovery    # a training loop that recovers in process
    import dlrun.checkpoint  # checkpoints in the node's memory

Importing `dlrun` imports nothing else (docs/guides/progress.md).
"""
