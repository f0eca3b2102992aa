"""Work spread over processes and machines: batch generation jobs (batch.py), where their units run (this
process or Ray actors: executor.py), the Ray cluster connection (cluster.py) and serving replicas. See
docs/scaling.md."""
