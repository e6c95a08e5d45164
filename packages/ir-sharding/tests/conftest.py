import jax

# Eight virtual CPU devices, set before jax starts its backend, for the jax oracle tests.
jax.config.update("jax_num_cpu_devices", 8)
