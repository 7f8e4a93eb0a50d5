"""Staging: model weights, calibration data and the serving image reach fleets with no internet."""
