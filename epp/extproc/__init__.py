"""The ext_proc protocol: a pure per-stream state machine (`stream`) and a thin grpc.aio adapter (`server`)."""
