"""Defaults the command line shows and the library applies, defined once so that `run --help`,
the request (and the reproduce line it writes) and the builders cannot disagree."""

from pathlib import Path

# Where sessions go unless told (`run --session`, `demo --session-root`), relative to the working directory.
SESSIONS_ROOT = Path(".bisect-npu") / "sessions"

# Seconds one probe or command run may take (--timeout); a local build command gets as long.
TRIAL_TIMEOUT_S = 3600.0
# Disk the candidate images (docker) or release venvs (--package) may take, in GiB (--cache-size).
CACHE_SIZE_GIB = 200
# How certain a statistical answer must be: the noisy searches (commits and settings) stop when one
# commit or configuration holds this share of the posterior (--confidence, the recipe's
# trials.confidence); the accuracy oracle's sequential tests and intervals use it too (accuracy.confidence).
CONFIDENCE = 0.99
# Fix proposals `fix --verify` and `run --verify-fix` try at most, best first, until one works (--verify-top).
VERIFY_TOP = 5
# `--good last-good`: the newest commit on the bad end's first-parent line the verdict store holds judged good.
LAST_GOOD = "last-good"
# A probe run that failed on the host (orchestration/running/infrastructure.py) is run again this many
# times before its trial is a skip, the k-th retry after RETRY_BACKOFF_S * 2**(k-1) seconds.
TRIAL_RETRIES = 3
RETRY_BACKOFF_S = 10.0
