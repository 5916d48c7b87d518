"""Starting a job: the launcher (one rank here, or ranks spawned by the elastic agent), each rank's
worker, and running the config's runners."""
