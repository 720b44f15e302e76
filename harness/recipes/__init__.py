"""Paper-scale recipes for verl and TRL: their launch commands, rewards and what they cost."""
