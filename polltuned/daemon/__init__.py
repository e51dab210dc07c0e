"""The daemon: controller (state machine), service (signals, sd_notify, loop), status, wiring."""
