"""Talking to people: the `kt` commands, the doctor's checks and their rendering, `kt bench`."""
