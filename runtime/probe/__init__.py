"""The consumer-side bench probe (stacks/consumer_probe.py): its user data and
systemd unit. The probe runs fleetcast.bench.job with the host's Python 3.11
(Amazon Linux 2023), not in the serving container. No CDK import."""
