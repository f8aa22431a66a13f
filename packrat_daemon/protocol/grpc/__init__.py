"""The gRPC transport: the service (`server`) and its stubs, generated from `inference.proto` and committed."""
