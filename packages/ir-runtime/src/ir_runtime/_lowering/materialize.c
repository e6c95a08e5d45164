/* ir::materialize on XLA's CPU: an FFI handler that hands its operand on as its result.
 *
 * XLA's CPU fusion copies an elementwise producer into every fusion that consumes it, and
 * evaluates it there once per element the consumer makes: a rotary embedding's cos and sin,
 * broadcast over the heads by 16 fusions of a small Llama's step, were evaluated per head in
 * each. A custom call is not fused, so its operand is computed once, into a buffer of its own.
 * The call is registered with its result aliasing its operand (the same buffer): the handler
 * then does nothing; where XLA gives it a buffer of its own, it copies the bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "xla/ffi/api/c_api.h"
#include "materialize.h"

/* Bytes per element of the dtypes the rule materializes, and of any other whole-byte type;
 * 0 for the packed and opaque ones. */
static size_t element_bytes(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8:
    case XLA_FFI_DataType_F8E5M2:
    case XLA_FFI_DataType_F8E3M4:
    case XLA_FFI_DataType_F8E4M3:
    case XLA_FFI_DataType_F8E4M3FN:
    case XLA_FFI_DataType_F8E4M3B11FNUZ:
    case XLA_FFI_DataType_F8E5M2FNUZ:
    case XLA_FFI_DataType_F8E4M3FNUZ:
    case XLA_FFI_DataType_F8E8M0FNU:
      return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
      return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32:
      return 4;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64:
      return 8;
    case XLA_FFI_DataType_C128:
      return 16;
    default:
      return 0;
  }
}

static XLA_FFI_Error* error(const XLA_FFI_CallFrame* frame, const char* message) {
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
  return frame->api->XLA_FFI_Error_Create(&args);
}

static XLA_FFI_Error* materialize(XLA_FFI_CallFrame* frame) {
  /* XLA first asks a handler which API version it was built for (the metadata extension). */
  XLA_FFI_Extension_Base* ext = frame->extension_start;
  if (ext != NULL && ext->type == XLA_FFI_Extension_Metadata) {
    XLA_FFI_Metadata* metadata = ((XLA_FFI_Metadata_Extension*)ext)->metadata;
    metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    metadata->api_version.extension_start = NULL;
    metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    metadata->traits = 0;
    return NULL;
  }
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) {
    return NULL;
  }
  if (frame->args.size != 1 || frame->rets.size != 1 ||
      frame->args.types[0] != XLA_FFI_ArgType_BUFFER ||
      frame->rets.types[0] != XLA_FFI_RetType_BUFFER) {
    return error(frame, "ir_runtime_materialize takes one buffer and returns one");
  }
  const XLA_FFI_Buffer* in = (const XLA_FFI_Buffer*)frame->args.args[0];
  XLA_FFI_Buffer* out = (XLA_FFI_Buffer*)frame->rets.rets[0];
  if (out->data == in->data) {
    return NULL; /* the result is the operand's buffer: nothing to do */
  }
  size_t bytes = element_bytes(in->dtype);
  if (bytes == 0) {
    return error(frame, "ir_runtime_materialize: a packed or opaque dtype has no bytes to copy");
  }
  if (out->dtype != in->dtype || out->rank != in->rank) {
    return error(frame, "ir_runtime_materialize: operand and result differ in dtype or rank");
  }
  for (int64_t k = 0; k < in->rank; k++) {
    if (out->dims[k] != in->dims[k]) {
      return error(frame, "ir_runtime_materialize: operand and result shapes differ");
    }
    bytes *= (size_t)in->dims[k];
  }
  memcpy(out->data, in->data, bytes);
  return NULL;
}

void* ir_runtime_materialize_handler(void) { return (void*)&materialize; }
