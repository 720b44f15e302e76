import os

from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
settings.register_profile("cliplab", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True, print_blob=True)
settings.load_profile("cliplab")
