"""The trainer: log-probs, critic, updates, SFT warm start, checkpoints and the RL loop."""
