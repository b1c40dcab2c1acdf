"""Model provisioning and supervision of the vLLM servers behind each tier."""
