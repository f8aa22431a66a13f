/* Discard the rest of a ZeroMQ message of many frames: no Python object, malloc or copy per frame.

zmq_recviov, libzmq's only receive of many frames in one call, copies each frame into a buffer it mallocs for
the caller to free; a message of millions of empty frames spends most of its time there. This loop receives
every frame into the same zmq_msg_t instead (a receive releases what the message held before).

libzmq's functions come as addresses, taken from the copy of libzmq pyzmq runs on (packrat_daemon/wire/zmqio.py
finds it): a second libzmq linked here would have its own idea of a socket. The loop runs without the GIL.
The module is optional: where it was not compiled, zmqio falls back to zmq_recviov. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* libzmq 4's message: 64 opaque bytes, pointer-aligned (zmq.h). */
typedef struct {
    _Alignas(void *) unsigned char bytes[64];
} zmq_msg;

typedef int (*msg_init_fn)(zmq_msg *);
typedef int (*msg_recv_fn)(zmq_msg *, void *, int);
typedef int (*msg_more_fn)(const zmq_msg *);
typedef int (*msg_close_fn)(zmq_msg *);

#define ZMQ_DONTWAIT 1

PyDoc_STRVAR(discard_doc,
             "discard(socket, most, msg_init, msg_recv, msg_more, msg_close) -> (frames, bytes, ended)\n\n"
             "Receive and drop up to `most` more frames of the message being received on the libzmq socket at\n"
             "address `socket`, without waiting, through the libzmq functions at the four addresses given.\n"
             "`ended`: its last frame was among them. Fewer frames and not ended: a receive failed (the caller\n"
             "asks pyzmq why).");

static PyObject *discard(PyObject *module, PyObject *args) {
    (void)module;
    unsigned long long socket_address, init_address, recv_address, more_address, close_address;
    Py_ssize_t most;
    if (!PyArg_ParseTuple(args, "KnKKKK", &socket_address, &most, &init_address, &recv_address, &more_address,
                          &close_address))
        return NULL;
    if (!socket_address || !init_address || !recv_address || !more_address || !close_address) {
        PyErr_SetString(PyExc_ValueError, "a null socket or libzmq function");
        return NULL;
    }
    void *socket = (void *)(uintptr_t)socket_address;
    msg_init_fn msg_init = (msg_init_fn)(uintptr_t)init_address;
    msg_recv_fn msg_recv = (msg_recv_fn)(uintptr_t)recv_address;
    msg_more_fn msg_more = (msg_more_fn)(uintptr_t)more_address;
    msg_close_fn msg_close = (msg_close_fn)(uintptr_t)close_address;

    Py_ssize_t frames = 0;
    unsigned long long size = 0;
    int ended = 0;
    zmq_msg message;
    Py_BEGIN_ALLOW_THREADS
    msg_init(&message);
    while (frames < most) {
        const int received = msg_recv(&message, socket, ZMQ_DONTWAIT);
        if (received < 0)
            break;
        frames++;
        size += (unsigned long long)received;
        if (!msg_more(&message)) {
            ended = 1;
            break;
        }
    }
    msg_close(&message);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("nKO", frames, size, ended ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"discard", discard, METH_VARARGS, discard_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_discard", "A compiled loop that discards the frames of a ZeroMQ message.", -1, methods,
};

PyMODINIT_FUNC PyInit__discard(void) { return PyModule_Create(&module); }
