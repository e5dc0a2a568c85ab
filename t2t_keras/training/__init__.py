"""Training: schedules, losses, distribution, checkpoints and the trainer loop."""
