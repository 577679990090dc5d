"""Webhooks: signed deliveries from providers, fanned out to endpoints as todos."""
