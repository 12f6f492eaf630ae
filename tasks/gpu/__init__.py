"""GPUs: nvidia-smi facts and GPU holders on the host, memory that really came back on the client."""
