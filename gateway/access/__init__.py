"""Access control on the request path: keys from the store, per-key scopes, rate limits and
token budgets (docs/operations.md).

    sync       each replica's copy of the store's keys and limits, refreshed on change
    admission  a request's scope check and its reservation against every configured limit
    shares     this replica's leased blocks of each counter, reserved from without the store
    ledger     reservations from the shares; a thread batches the rest into one turn
    grants     that turn's store transaction: grant, flush, return, renew the leases
    windows    the UTC minute, day and month a counter belongs to
"""
