"""Weight sync between the trainer and the inference replicas: one protocol (`protocol`) and one
module per transport holding both its halves (`grpc_stream`, `ipc`, `collective`)."""
