"""Pulsar admin REST API v2 and HTTP lookup, served by aiohttp on the web port."""
