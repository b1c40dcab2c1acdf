"""Access control on the request path: keys from the store, per-key scopes, rate limits and
token budgets (docs/operations.md).

    sync       each replica's copy of the store's keys and limits, refreshed on change
    admission  a request's scope check and its reservation against every configured limit
    ledger     the reservations, batched into one store transaction per turn of its thread
    windows    the UTC minute, day and month a counter belongs to
"""
