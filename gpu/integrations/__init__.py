"""Plug-ins that run cliplab's losses inside other trainers (verl, TRL). Imported on demand only."""
