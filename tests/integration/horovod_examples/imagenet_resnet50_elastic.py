"""In the shape of Horovod's ``examples/elastic/pytorch/pytorch_imagenet_resnet50_elastic.py`` (written anew).

Same structure, flags and Horovod calls: ``ElasticSampler`` for training and
validation (kept in the ``TorchState`` by name), ``record_batch``, local
gradient accumulation over ``--batches-per-allreduce`` sub-batches
(``backward_passes_per_step``), ``--gradient-predivide-factor``,
``hvd.Compression`` from ``--fp16-allreduce``, ``op=hvd.Adasum if
--use-adasum else hvd.Average``, commits every ``--batches-per-commit`` and
``check_host_updates()`` every ``--batches-per-host-check`` batches, an
``hvd.allreduce`` per metric per sub-batch, the learning-rate warm-up that
reads ``hvd.size()``, and rank 0's checkpoint per epoch that a restart
resumes from. Its Horovod import is ``cloud_elastic.torch``. Not its shape:
the images are generated (``instrument.images``, small), the model is a
small ResNet (no torchvision here), tqdm and TensorBoard are used when
installed, and ``instrument`` calls (marked) report to the tests.
"""

import argparse
import math
import os

import torch
import torch.backends.cudnn as cudnn
import torch.multiprocessing as mp
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import cloud_elastic.torch as hvd
import instrument  # test instrumentation
from instrument import models  # in place of torchvision's

try:
    from tqdm import tqdm
except ImportError:
    tqdm = instrument.NoProgress
try:
    from torch.utils.tensorboard import SummaryWriter
except ImportError:
    SummaryWriter = None

parser = argparse.ArgumentParser(description='ImageNet ResNet-50, elastic',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--train-dir', default=None, help='unused: the images are generated')
parser.add_argument('--val-dir', default=None, help='unused: the images are generated')
parser.add_argument('--log-dir', default='./logs', help='TensorBoard log directory')
parser.add_argument('--checkpoint-format', default='./checkpoint-{epoch}.pth.tar', help='checkpoint file format')

parser.add_argument('--fp16-allreduce', action='store_true', default=False, help='compress gradients to fp16')
parser.add_argument('--batches-per-allreduce', type=int, default=1,
                    help='sub-batches accumulated locally before each allreduce')
parser.add_argument('--use-adasum', action='store_true', default=False, help='reduce with Adasum')
parser.add_argument('--gradient-predivide-factor', type=float, default=1.0,
                    help='divide gradients by this before the sum (and by size/this after)')

parser.add_argument('--batches-per-commit', type=int, default=10, help='batches between state.commit()')
parser.add_argument('--batches-per-host-check', type=int, default=2, help='batches between state.check_host_updates()')

parser.add_argument('--batch-size', type=int, default=4, help='training sub-batch size')
parser.add_argument('--val-batch-size', type=int, default=8, help='validation batch size')
parser.add_argument('--epochs', type=int, default=4, help='epochs to train')
parser.add_argument('--base-lr', type=float, default=0.0125, help='learning rate of one worker')
parser.add_argument('--warmup-epochs', type=float, default=1, help='epochs of learning-rate warm-up')
parser.add_argument('--momentum', type=float, default=0.9, help='SGD momentum')
parser.add_argument('--wd', type=float, default=0.00005, help='weight decay')

parser.add_argument('--no-cuda', action='store_true', default=False, help='train on the CPU')
parser.add_argument('--seed', type=int, default=42, help='random seed')
parser.add_argument('--train-size', type=int, default=192, help='generated training images (not a Horovod flag)')


def train(state):
    model.train()
    epoch = state.epoch
    train_loss = Metric('train_loss')
    train_accuracy = Metric('train_accuracy')

    batch_offset = state.batch
    with tqdm(total=len(train_loader), desc='Train Epoch #{}'.format(epoch + 1), disable=not verbose) as t:
        for idx, (data, target) in enumerate(train_loader):
            # Commit, or at least look for membership changes, at the start of a batch.
            state.batch = batch_idx = batch_offset + idx
            if args.batches_per_commit > 0 and state.batch % args.batches_per_commit == 0:
                state.commit()
            elif args.batches_per_host_check > 0 and state.batch % args.batches_per_host_check == 0:
                state.check_host_updates()

            adjust_learning_rate(epoch, batch_idx)

            if args.cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            # Accumulate gradients over sub-batches of batch_size.
            for i in range(0, len(data), args.batch_size):
                data_batch = data[i:i + args.batch_size]
                target_batch = target[i:i + args.batch_size]
                output = model(data_batch)
                train_accuracy.update(accuracy(output, target_batch))
                loss = F.cross_entropy(output, target_batch)
                train_loss.update(loss)
                loss.div_(math.ceil(float(len(data)) / args.batch_size))
                loss.backward()

            # Mark this batch as processed, on every worker, so a reset does not repeat it.
            state.train_sampler.record_batch(idx, allreduce_batch_size)

            optimizer.step()
            instrument.step(hvd, train_loss.avg, epoch=epoch, batch=batch_idx)  # test instrumentation
            t.set_postfix({'loss': train_loss.avg.item(), 'accuracy': train_accuracy.avg.item()})
            t.update(1)

    if log_writer:
        log_writer.add_scalar('train/loss', train_loss.avg, epoch)
        log_writer.add_scalar('train/accuracy', train_accuracy.avg, epoch)

    state.commit()


def validate(epoch):
    model.eval()
    val_loss = Metric('val_loss')
    val_accuracy = Metric('val_accuracy')

    with tqdm(total=len(val_loader), desc='Validate Epoch #{}'.format(epoch + 1), disable=not verbose) as t:
        with torch.no_grad():
            for data, target in val_loader:
                if args.cuda:
                    data, target = data.cuda(), target.cuda()
                output = model(data)
                val_loss.update(F.cross_entropy(output, target))
                val_accuracy.update(accuracy(output, target))
                t.set_postfix({'loss': val_loss.avg.item(), 'accuracy': 100. * val_accuracy.avg.item()})
                t.update(1)

    if log_writer:
        log_writer.add_scalar('val/loss', val_loss.avg, epoch)
        log_writer.add_scalar('val/accuracy', val_accuracy.avg, epoch)
    instrument.event("validated", rank=hvd.rank(), size=hvd.size(), epoch=epoch,  # test instrumentation
                     loss=val_loss.avg.item(), accuracy=val_accuracy.avg.item())


# Warm the learning rate up from base_lr to base_lr * size over the first epochs (Goyal et al.), then decay it.
def adjust_learning_rate(epoch, batch_idx):
    if epoch < args.warmup_epochs:
        epoch += float(batch_idx + 1) / len(train_loader)
        lr_adj = 1. / hvd.size() * (epoch * (hvd.size() - 1) / args.warmup_epochs + 1)
    elif epoch < 30:
        lr_adj = 1.
    elif epoch < 60:
        lr_adj = 1e-1
    elif epoch < 80:
        lr_adj = 1e-2
    else:
        lr_adj = 1e-3
    for param_group in optimizer.param_groups:
        param_group['lr'] = args.base_lr * hvd.size() * args.batches_per_allreduce * lr_adj


def accuracy(output, target):
    pred = output.max(1, keepdim=True)[1]
    return pred.eq(target.view_as(pred)).cpu().float().mean()


def save_checkpoint(epoch):
    if hvd.rank() == 0:
        filepath = args.checkpoint_format.format(epoch=epoch + 1)
        state = {
            'model': model.state_dict(),
            'optimizer': optimizer.state_dict(),
        }
        torch.save(state, filepath)


def end_epoch(state):
    state.epoch += 1
    state.batch = 0
    state.train_sampler.set_epoch(state.epoch)
    state.commit()


# Metrics averaged over the workers.
class Metric(object):
    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.)
        self.n = torch.tensor(0.)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


@hvd.elastic.run
def full_train(state):
    while state.epoch < args.epochs:
        train(state)
        validate(state.epoch)
        save_checkpoint(state.epoch)
        end_epoch(state)


if __name__ == '__main__':
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    allreduce_batch_size = args.batch_size * args.batches_per_allreduce

    hvd.init()
    instrument.event("hello", rank=hvd.rank(), size=hvd.size())  # test instrumentation
    torch.manual_seed(args.seed)

    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)

    cudnn.benchmark = True

    verbose = 1 if hvd.rank() == 0 else 0

    log_writer = SummaryWriter(args.log_dir) if hvd.rank() == 0 and SummaryWriter is not None else None

    torch.set_num_threads(1)

    kwargs = {'num_workers': 0, 'pin_memory': True} if args.cuda else {}
    # forkserver rather than fork for data-loader workers, where supported (fork-unsafe network stacks).
    if (kwargs.get('num_workers', 0) > 0 and hasattr(mp, '_supports_context') and
            mp._supports_context and 'forkserver' in mp.get_all_start_methods()):
        kwargs['multiprocessing_context'] = 'forkserver'

    train_dataset = instrument.images(args.train_size, 10, (3, 16, 16), seed=1)
    train_sampler = hvd.elastic.ElasticSampler(train_dataset)
    train_loader = torch.utils.data.DataLoader(
        train_dataset,
        batch_size=allreduce_batch_size,
        sampler=train_sampler,
        **kwargs)

    val_dataset = instrument.images(48, 10, (3, 16, 16), seed=2)
    val_sampler = hvd.elastic.ElasticSampler(val_dataset)
    val_loader = torch.utils.data.DataLoader(
        val_dataset,
        batch_size=args.val_batch_size,
        sampler=val_sampler,
        **kwargs)

    model = models.resnet50()

    lr_scaler = args.batches_per_allreduce * hvd.size() if not args.use_adasum else 1

    if args.cuda:
        model.cuda()
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = args.batches_per_allreduce * hvd.local_size()

    optimizer = optim.SGD(model.parameters(),
                          lr=(args.base_lr * lr_scaler),
                          momentum=args.momentum, weight_decay=args.wd)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=compression,
        backward_passes_per_step=args.batches_per_allreduce,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor)

    # Resume from the newest checkpoint, on rank 0, which the first sync broadcasts to the others.
    resume_from_epoch = 0
    if hvd.rank() == 0:
        for try_epoch in range(args.epochs, 0, -1):
            if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
                resume_from_epoch = try_epoch
                break

        if resume_from_epoch > 0:
            filepath = args.checkpoint_format.format(epoch=resume_from_epoch)
            checkpoint = torch.load(filepath)
            model.load_state_dict(checkpoint['model'])
            optimizer.load_state_dict(checkpoint['optimizer'])

    state = hvd.elastic.TorchState(model=model,
                                   optimizer=optimizer,
                                   train_sampler=train_sampler,
                                   val_sampler=val_sampler,
                                   epoch=resume_from_epoch,
                                   batch=0)

    full_train(state)
    instrument.done(hvd, model, epoch=state.epoch)  # test instrumentation
