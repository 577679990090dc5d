"""The agent JSON API: token-authenticated views over the store."""
