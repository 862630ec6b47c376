import os

from hypothesis import HealthCheck, settings

# ci: derandomized and bounded, for make test. fuzz: a long randomized campaign, for make fuzz.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("fuzz", deadline=None, print_blob=True, max_examples=10_000,
                          suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
