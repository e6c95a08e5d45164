import ir_runtime

# Eight virtual CPU devices for every integration test.
ir_runtime.init(cpu_devices=8)
