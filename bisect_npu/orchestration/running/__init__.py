"""Running a candidate: its build and trials (with the host's retries), the probe requests and
observations, the judging of its runs, the slots a round runs in."""
