"""copy_ into p.to_local() of an FSDP2 sharded param without torch.no_grad()."""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from common import free_port, init_world, build_model
init_world(0, 1, free_port())
m = build_model(init_device_mesh("cpu", (1,)))
p = next(m.parameters())
try:
    p.to_local().copy_(torch.zeros_like(p.to_local())); print("no error")
except Exception as e:
    print(type(e).__name__, ":", str(e).splitlines()[0])
with torch.no_grad():
    p.to_local().copy_(torch.zeros_like(p.to_local()))
print("with no_grad ok, param now zero:", bool((p.to_local() == 0).all()), "| to_local shares storage with FSDP sharded data:",
      p.to_local().untyped_storage().data_ptr() == m.layers[0]._get_fsdp_state()._fsdp_param_groups[0].fsdp_params[0]._sharded_param_data.untyped_storage().data_ptr())
dist.destroy_process_group()
