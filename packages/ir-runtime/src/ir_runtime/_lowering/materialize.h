/* The FFI handler of ir::materialize on XLA's CPU (materialize.c), as a pointer for a capsule. */
#ifndef IR_RUNTIME_MATERIALIZE_H_
#define IR_RUNTIME_MATERIALIZE_H_
void* ir_runtime_materialize_handler(void);
#endif
