"""The JAX frontend (bagua_jax)."""
