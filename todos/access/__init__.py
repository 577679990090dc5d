"""Who may do what: endpoints, their tokens and grants, and the secrets kept for them.

- ``auth``: a request's token or SQS access key turned into its endpoint, with
  the per-process credential cache.
- ``tokens``: endpoint tokens, stored only as a hash.
- ``endpoints``: an endpoint's lifecycle (create, rotate, revoke) and its grants.
- ``crypto``: encryption at rest for the secrets that must be read back (SQS
  secret keys, webhook signing secrets).
- ``stored_secrets``: those secrets surveyed and moved to the current key.
"""
