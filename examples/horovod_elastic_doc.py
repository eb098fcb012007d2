"""The "Elastic PyTorch" example from Horovod's elastic documentation, ported.

What changed from Horovod's docs/elastic.rst, line for line:

* ``import horovod.torch as hvd`` became ``import cloud_elastic.torch as hvd``;
* the ``...`` placeholders (dataset, model, hyper-parameters, ``get_random_batch``)
  are filled with a small synthetic problem so the script runs;
* ``torch.cuda.set_device`` is guarded so the script also runs on CPU-only machines.

Everything between the markers is Horovod's code unchanged.

    cloud-elastic run -np 2 -H 127.0.0.1:2 python examples/horovod_elastic_doc.py
"""

import torch
import torch.nn.functional as F
import torch.optim as optim

import cloud_elastic.torch as hvd

# --- placeholders of the documentation, filled in --------------------------
lr = 0.01
epochs = 2
batches_per_epoch = 20
batches_per_commit = 1
model = torch.nn.Sequential(torch.nn.Linear(20, 10), torch.nn.LogSoftmax(dim=1))


def get_random_batch():
    data = torch.randn(16, 20)
    return data, data[:, :10].argmax(dim=1)


# --- Horovod's example -------------------------------------------------------
hvd.init()

if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank())

optimizer = optim.SGD(model.parameters(), lr * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer)


@hvd.elastic.run
def train(state):
    batch_offset = state.batch
    for state.epoch in range(state.epoch, epochs):
        for state.batch in range(state.batch, batches_per_epoch):
            data, target = get_random_batch()

            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()

            if state.batch % batches_per_commit == 0:
                state.commit()
        state.batch = 0


def on_state_reset():
    # adjust learning rate on reset
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
# --- end of Horovod's example -----------------------------------------------

if hvd.rank() == 0:
    print(f"finished {state.epoch + 1} epochs on {hvd.size()} worker(s)", flush=True)
