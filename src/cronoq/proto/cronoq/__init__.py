"""Proto package `cronoq` (mirrors the proto's directory so its file name stays cronoq/...)."""
