"""In the shape of Horovod's ``examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py`` (written anew).

Same structure, flags and Horovod calls, at module level where it makes them:
``hvd.Compression`` chosen from ``--fp16-allreduce``, ``op=hvd.Adasum if
--use-adasum else hvd.Average``, ``hvd.nccl_built()``, a ``TorchState`` with
plain attributes, commits inside a ``timeit`` loop, a reset callback that
rescales the learning rate. Its Horovod import is ``cloud_elastic.torch``.
Not its shape: the model is a small network of the kind named (no
torchvision here), the fixed fake batch is small (``--image-size``), and
``instrument`` calls (marked) report to the tests.
"""

import argparse
import timeit

import numpy as np
import torch.backends.cudnn as cudnn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import cloud_elastic.torch as hvd
import instrument  # test instrumentation
from instrument import models  # in place of torchvision's

parser = argparse.ArgumentParser(description='Synthetic benchmark, elastic',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                    help='compress gradients to fp16 for the allreduce')
parser.add_argument('--model', type=str, default='resnet50', help='model to benchmark')
parser.add_argument('--batch-size', type=int, default=8, help='input batch size')
parser.add_argument('--image-size', type=int, default=16, help='side of the fake images (not a Horovod flag)')
parser.add_argument('--num-warmup-batches', type=int, default=3, help='batches before timing starts')
parser.add_argument('--num-batches-per-iter', type=int, default=5, help='batches per timed iteration')
parser.add_argument('--num-iters', type=int, default=10, help='timed iterations')
parser.add_argument('--num-batches-per-commit', type=int, default=1, help='batches per commit of the state')
parser.add_argument('--no-cuda', action='store_true', default=False, help='train on the CPU')
parser.add_argument('--use-adasum', action='store_true', default=False, help='reduce with Adasum')

args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
instrument.event("hello", rank=hvd.rank(), size=hvd.size())  # test instrumentation

if args.cuda:
    torch.cuda.set_device(hvd.local_rank())

cudnn.benchmark = True

model = getattr(models, args.model)()


# Adasum needs no learning-rate scaling; an average does.
def lr_scaler():
    return hvd.size() if not args.use_adasum else 1


if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

lr = 0.01
optimizer = optim.SGD(model.parameters(), lr=lr * lr_scaler())

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)

# One fixed fake batch, drawn once per worker.
data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.LongTensor(args.batch_size).random_() % 1000
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step(state):
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()
    instrument.step(hvd, loss)  # test instrumentation

    state.batch += 1
    if state.batch == args.num_batches_per_commit:
        state.batch = 0
        state.commit()


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end='\n' if nl else '')


log('Model: %s' % args.model)
log('Batch size: %d' % args.batch_size)
device = 'GPU' if args.cuda else 'CPU'
log('Number of %ss: %d' % (device, hvd.size()))


@hvd.elastic.run
def run_benchmark(state):
    if not state.warm:
        log('Running warmup...')
        timeit.timeit(lambda: benchmark_step(state), number=args.num_warmup_batches)
        state.warm = True
        state.commit()

    if state.iter == 0:
        log('Running benchmark...')
    for x in range(state.iter, args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(state), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log('Iter #%d: %.1f img/sec per %s' % (x, img_sec, device))
        state.img_secs.append(img_sec)
        state.iter = x
        state.commit()


def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr * lr_scaler()
    instrument.event("reset", rank=hvd.rank(), size=hvd.size(), lr=optimizer.param_groups[0]['lr'])  # test instrumentation


state = hvd.elastic.TorchState(model, optimizer, img_secs=[], iter=0, batch=0, warm=False)
state.register_reset_callbacks([on_state_reset])
run_benchmark(state)

img_sec_mean = np.mean(state.img_secs)
img_sec_conf = 1.96 * np.std(state.img_secs)
log('Img/sec per %s: %.1f +-%.1f' % (device, img_sec_mean, img_sec_conf))
log('Total img/sec on %d %s(s): %.1f +-%.1f' %
    (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))
instrument.done(hvd, model, iters=len(state.img_secs))  # test instrumentation
