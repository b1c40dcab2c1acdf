"""Thin HTTP routers, one per group of endpoints."""
