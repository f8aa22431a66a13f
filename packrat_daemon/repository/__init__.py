"""`packrat serve --repository`: every model of a model repository served from one command, one daemon per model
behind one Open Inference Protocol gateway with Triton's repository extension, and the joint core plan over the
models loaded (docs/repository.md)."""
