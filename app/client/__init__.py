"""The QForge client SDK."""
