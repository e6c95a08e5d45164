// The device guard of torch's XLA device type, for the engine's tensors named "xla".
//
// torch asks a device type's guard, in C++, for the current device and stream: autograd for
// every tensor that requires grad (InputMetadata), Tensor.to for a device given without an
// index. torch_xla registers one in its extension; this is the engine's, loaded by
// ir_runtime.torch_xla.install(). The engine has one device per process, xla:0 (its SPMD
// programs place data on the real devices themselves), and no streams beyond the default.
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {

constexpr c10::DeviceType kXla = c10::DeviceType::XLA;

struct XlaGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kXla; }
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(kXla, 0); }
  c10::Device getDevice() const override { return c10::Device(kXla, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kXla, 0));
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};

C10_REGISTER_GUARD_IMPL(XLA, XlaGuard);

}  // namespace
