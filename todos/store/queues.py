"""Queue settings (the ``queues`` table): defaults per queue, pause and resume."""
