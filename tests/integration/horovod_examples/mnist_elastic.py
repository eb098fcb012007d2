"""In the shape of Horovod's ``examples/elastic/pytorch/pytorch_mnist_elastic.py`` (written anew).

Same structure, flags and Horovod calls, at module level where it makes them:
a ``DistributedSampler`` sharded by ``hvd.size()``/``hvd.rank()`` at start,
``hvd.Compression`` from ``--fp16-allreduce``, ``op=hvd.Adasum if --use-adasum
else hvd.Average`` (named at module level even without the flag), ``state.model``
and ``state.optimizer`` inside the training function, a commit per batch,
and ``hvd.allreduce`` of metrics after training. Its Horovod import is
``cloud_elastic.torch``. Not its shape: the images are generated
(``instrument.images``, 28x28 as MNIST's), never downloaded, and
``instrument`` calls (marked) report to the tests.
"""

import argparse

import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import cloud_elastic.torch as hvd
import instrument  # test instrumentation

parser = argparse.ArgumentParser(description='MNIST, elastic')
parser.add_argument('--batch-size', type=int, default=16, metavar='N', help='training batch size')
parser.add_argument('--test-batch-size', type=int, default=64, metavar='N', help='test batch size')
parser.add_argument('--epochs', type=int, default=3, metavar='N', help='epochs to train')
parser.add_argument('--lr', type=float, default=0.01, metavar='LR', help='learning rate of one worker')
parser.add_argument('--momentum', type=float, default=0.5, metavar='M', help='SGD momentum')
parser.add_argument('--no-cuda', action='store_true', default=False, help='train on the CPU')
parser.add_argument('--seed', type=int, default=42, metavar='S', help='random seed')
parser.add_argument('--log-interval', type=int, default=10, metavar='N', help='batches between log lines')
parser.add_argument('--fp16-allreduce', action='store_true', default=False, help='compress gradients to fp16')
parser.add_argument('--use-adasum', action='store_true', default=False, help='reduce with Adasum')
parser.add_argument('--data-dir', help='unused: the images are generated')
parser.add_argument('--train-size', type=int, default=512, help='generated training images (not a Horovod flag)')

args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
instrument.event("hello", rank=hvd.rank(), size=hvd.size())  # test instrumentation
torch.manual_seed(args.seed)

if args.cuda:
    torch.cuda.set_device(hvd.local_rank())
    torch.cuda.manual_seed(args.seed)

# One CPU thread per worker.
torch.set_num_threads(1)

kwargs = {'num_workers': 1, 'pin_memory': True} if args.cuda else {}
train_dataset = instrument.images(args.train_size, 10, (1, 28, 28), seed=1)
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(
    train_dataset, batch_size=args.batch_size, sampler=train_sampler, **kwargs)

test_dataset = instrument.images(128, 10, (1, 28, 28), seed=2)
test_sampler = torch.utils.data.distributed.DistributedSampler(
    test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                          sampler=test_sampler, **kwargs)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


model = Net()

lr_scaler = hvd.size() if not args.use_adasum else 1

if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, args.epochs + 1):
        state.model.train()

        train_sampler.set_epoch(state.epoch)
        steps_remaining = len(train_loader) - state.batch

        for state.batch, (data, target) in enumerate(train_loader):
            if state.batch >= steps_remaining:
                break

            if args.cuda:
                data, target = data.cuda(), target.cuda()
            state.optimizer.zero_grad()
            output = state.model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            state.optimizer.step()
            instrument.step(hvd, loss, epoch=state.epoch)  # test instrumentation
            if state.batch % args.log_interval == 0:
                print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                    state.epoch, state.batch * len(data), len(train_sampler),
                    100.0 * state.batch / len(train_loader), loss.item()))
            state.commit()
        state.batch = 0


def test():
    model.eval()
    test_loss = 0.
    test_accuracy = 0.
    for data, target in test_loader:
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        output = model(data)
        test_loss += F.nll_loss(output, target, reduction='sum').item()
        pred = output.data.max(1, keepdim=True)[1]
        test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum()

    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)

    test_loss = metric_average(test_loss, 'avg_loss')
    test_accuracy = metric_average(test_accuracy, 'avg_accuracy')

    if hvd.rank() == 0:
        print('\nTest set: Average loss: {:.4f}, Accuracy: {:.2f}%\n'.format(
            test_loss, 100. * test_accuracy))
    return test_loss, test_accuracy


optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)


def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group['lr'] = args.lr * hvd.size()
    instrument.event("reset", rank=hvd.rank(), size=hvd.size(), lr=optimizer.param_groups[0]['lr'])  # test instrumentation


state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
test_loss, test_accuracy = test()
instrument.done(hvd, model, test_loss=test_loss, test_accuracy=float(test_accuracy))  # test instrumentation
