"""The trajectory store: schema (``schema``), engines and migrations (``database``), packed
token arrays (``codec``) and the tenant-scoped reads behind the API (``queries``)."""
