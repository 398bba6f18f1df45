/*
 * The job-spec contract: a table of valid and invalid specs with the error
 * code each must produce, fusion-key equalities and inequalities, canonical
 * form stability, shape/parameter/FLOP inference and the LR schedule.
 *
 * Specs are written with single quotes for readability; they are turned into
 * JSON double quotes before parsing.
 */
#include "check.h"
#include "jobspec.h"

#include <stdlib.h>

#define MLP                                                                                        \
    "'model':{'input':[1,28,28],'layers':[{'type':'flatten'},{'type':'linear','out':32},"         \
    "{'type':'relu'},{'type':'linear','out':10}]}"
#define REST "'batch_size':64,'steps':100,'optimizer':{'type':'sgd','lr':0.1}"
#define DS "'dataset':'fashion-mnist'"
#define SPEC(...) "{" DS "," MLP "," REST __VA_ARGS__ "}"
#define WITH_MODEL(layers, ...)                                                                    \
    "{" DS ",'model':{'input':[1,28,28],'layers':[" layers "]}," REST __VA_ARGS__ "}"

/* a token model: records of T = 16 ids below V = 40 */
#define TOK_IN "'input':{'tokens':16,'vocab':40}"
#define TOKENS(layers, ...)                                                                        \
    "{'dataset':'licence-text','model':{" TOK_IN ",'layers':[" layers "]}," REST __VA_ARGS__ "}"
#define EMB "{'type':'embedding','dim':32}"
#define BLOCK "{'type':'transformer_block','heads':4}"
#define LM_HEAD "{'type':'layernorm'},{'type':'linear','out':40}"

typedef struct spec_case {
    const char *name;
    const char *json;
    int expect;
    const char *msg_has; /* substring the message must contain, or NULL */
} spec_case;

static const spec_case cases[] = {
    /* ---- valid ---- */
    {"minimal mlp", SPEC(), FB_OK, NULL},
    {"design example",
     "{'name':'fmnist-mlp','dataset':'fashion-mnist','model':{'input':[1,28,28],'layers':["
     "{'type':'flatten'},{'type':'linear','out':256},{'type':'relu'},{'type':'dropout','p':0.1},"
     "{'type':'linear','out':10}]},'loss':'cross_entropy','batch_size':128,'steps':3000,"
     "'optimizer':{'type':'adamw','lr':0.003,'betas':[0.9,0.999],'eps':1e-8,'weight_decay':0.01},"
     "'schedule':{'type':'cosine','warmup_steps':100},'seed':7,'data_seed':0,'eval_every':500,"
     "'checkpoint_every':1000,'parallel':{'data':1,'pipeline':1},'priority':50,'max_restarts':3}",
     FB_OK, NULL},
    {"cnn", WITH_MODEL("{'type':'conv2d','out':8,'kernel':3,'padding':1},{'type':'batchnorm'},"
                       "{'type':'relu'},{'type':'maxpool2d','kernel':2},"
                       "{'type':'conv2d','out':16,'kernel':3},{'type':'batchnorm','momentum':0.2},"
                       "{'type':'relu'},{'type':'avgpool2d','kernel':2},{'type':'flatten'},"
                       "{'type':'dropout','p':0.0},{'type':'linear','out':10}"),
     FB_OK, NULL},
    {"residual identity",
     WITH_MODEL("{'type':'conv2d','out':4,'kernel':3,'padding':1},{'type':'residual','body':["
                "{'type':'conv2d','out':4,'kernel':3,'padding':1},{'type':'relu'}]},"
                "{'type':'global_avgpool'},{'type':'linear','out':10}"),
     FB_OK, NULL},
    {"residual conv shortcut",
     WITH_MODEL("{'type':'residual','body':[{'type':'conv2d','out':4,'kernel':3,'stride':2,"
                "'padding':1},{'type':'batchnorm'}],'shortcut':[{'type':'conv2d','out':4,"
                "'kernel':1,'stride':2,'bias':false}]},{'type':'flatten'},"
                "{'type':'linear','out':10}"),
     FB_OK, NULL},
    {"activations and layernorm",
     WITH_MODEL("{'type':'flatten'},{'type':'linear','out':16},{'type':'gelu','approximate':'tanh'},"
                "{'type':'layernorm'},{'type':'gelu'},{'type':'tanh'},{'type':'sigmoid'},"
                "{'type':'linear','out':10}"),
     FB_OK, NULL},
    {"layernorm on images", WITH_MODEL("{'type':'layernorm','eps':1e-6,'affine':false},"
                                       "{'type':'flatten'},{'type':'linear','out':10}"),
     FB_OK, NULL},
    {"avgpool padded", WITH_MODEL("{'type':'avgpool2d','kernel':3,'stride':2,'padding':1},"
                                  "{'type':'flatten'},{'type':'linear','out':10}"),
     FB_OK, NULL},
    {"epochs", "{" DS "," MLP ",'batch_size':64,'epochs':2,'optimizer':{'type':'sgd','lr':0.1}}",
     FB_OK, NULL},
    {"adam step schedule",
     "{" DS "," MLP ",'batch_size':64,'steps':100,'optimizer':{'type':'adam','lr':1e-3,"
     "'betas':[0.8,0.99],'eps':1e-6},'schedule':{'type':'step','step_size':10,'gamma':0.5,"
     "'warmup_steps':5}}",
     FB_OK, NULL},
    {"mse", WITH_MODEL("{'type':'flatten'},{'type':'linear','out':1}", ",'loss':'mse'"), FB_OK,
     NULL},
    {"sgd nesterov",
     "{" DS "," MLP ",'batch_size':64,'steps':100,'optimizer':{'type':'sgd','lr':0.1,"
     "'momentum':0.9,'nesterov':true,'weight_decay':5e-4}}",
     FB_OK, NULL},
    {"kernel pair", WITH_MODEL("{'type':'conv2d','out':2,'kernel':[3,5],'stride':[1,2]},"
                               "{'type':'flatten'},{'type':'linear','out':10}"),
     FB_OK, NULL},
    {"feature input",
     "{'dataset':'tabular','model':{'input':[10],'layers':[{'type':'linear','out':4},"
     "{'type':'batchnorm'},{'type':'relu'},{'type':'linear','out':3}]}," REST "}",
     FB_OK, NULL},
    {"options", SPEC(",'data':{'shuffle':false},'precision':'tf32','parallel':{'data':2,"
                     "'pipeline':2},'priority':0,'max_restarts':0,'name':'A-b_c.1'"),
     FB_OK, NULL},
    {"bf16", SPEC(",'precision':'bf16','parallel':{'data':2}"), FB_OK, NULL},
    {"bf16 pipeline", SPEC(",'precision':'bf16','parallel':{'pipeline':2}"), FB_OK, NULL},
    {"init", SPEC(",'init':'weights/start.safetensors'"), FB_OK, NULL},
    {"init job", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b'}"), FB_OK, NULL},
    {"init job final", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                            "'checkpoint':'final'}"), FB_OK, NULL},
    {"init job latest", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                             "'checkpoint':'latest'}"), FB_OK, NULL},
    {"init job step", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                           "'checkpoint':200}"), FB_OK, NULL},

    /* ---- init: the service's form ---- */
    {"init number", SPEC(",'init':7"), FB_ERR_WRONG_TYPE, "init"},
    {"init array", SPEC(",'init':['a']"), FB_ERR_WRONG_TYPE, "init"},
    {"init empty path", SPEC(",'init':''"), FB_ERR_BAD_NAME, "init"},
    {"init no job", SPEC(",'init':{'checkpoint':'final'}"), FB_ERR_MISSING_FIELD, "init.job"},
    {"init job upper", SPEC(",'init':{'job':'0B6E1C2A-3F4D-4E5F-8A9B-0C1D2E3F4A5B'}"),
     FB_ERR_BAD_NAME, "init.job"},
    {"init job path", SPEC(",'init':{'job':'../other-tenant/job/model.safetensors'}"),
     FB_ERR_BAD_NAME, "init.job"},
    {"init job number", SPEC(",'init':{'job':5}"), FB_ERR_WRONG_TYPE, "init.job"},
    {"init unknown field", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                                "'path':'x'}"), FB_ERR_UNKNOWN_FIELD, "path"},
    {"init checkpoint word", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                                  "'checkpoint':'best'}"), FB_ERR_BAD_ENUM, "init.checkpoint"},
    {"init checkpoint negative", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                                      "'checkpoint':-1}"), FB_ERR_OUT_OF_RANGE, "init.checkpoint"},
    {"init checkpoint real", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                                  "'checkpoint':1.5}"), FB_ERR_WRONG_TYPE, "init.checkpoint"},
    {"init checkpoint huge", SPEC(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                                  "'checkpoint':99999999999999}"), FB_ERR_OUT_OF_RANGE,
     "init.checkpoint"},

    /* ---- syntax and structure ---- */
    {"not json", "{'dataset':", FB_ERR_JSON_SYNTAX, "invalid JSON"},
    {"empty body", "", FB_ERR_JSON_SYNTAX, NULL},
    {"array root", "[1,2]", FB_ERR_NOT_OBJECT, NULL},
    {"duplicate key", SPEC(",'steps':5"), FB_ERR_JSON_SYNTAX, "duplicate"},
    {"number overflow", SPEC(",'seed':1e400"), FB_ERR_JSON_SYNTAX, NULL},
    {"unknown top field", SPEC(",'lrate':0.1"), FB_ERR_UNKNOWN_FIELD, "lrate"},
    {"unknown layer field", WITH_MODEL("{'type':'flatten','dim':1},{'type':'linear','out':10}"),
     FB_ERR_UNKNOWN_FIELD, "model.layers[0].dim"},
    {"unknown parallel field", SPEC(",'parallel':{'tensor':2}"), FB_ERR_UNKNOWN_FIELD, NULL},
    {"missing dataset", "{" MLP "," REST "}", FB_ERR_MISSING_FIELD, "dataset"},
    {"missing optimizer", "{" DS "," MLP ",'batch_size':64,'steps':100}", FB_ERR_MISSING_FIELD,
     "optimizer"},
    {"missing lr", "{" DS "," MLP ",'batch_size':64,'steps':100,'optimizer':{'type':'adam'}}",
     FB_ERR_MISSING_FIELD, "optimizer.lr"},
    {"missing layer type", WITH_MODEL("{'out':3}"), FB_ERR_MISSING_FIELD, "type"},
    {"missing steps", "{" DS "," MLP ",'batch_size':64,'optimizer':{'type':'sgd','lr':0.1}}",
     FB_ERR_MISSING_FIELD, "steps"},
    {"step schedule without size", SPEC(",'schedule':{'type':'step'}"), FB_ERR_MISSING_FIELD,
     "step_size"},

    /* ---- types ---- */
    {"batch string", "{" DS "," MLP ",'batch_size':'64','steps':1,"
                     "'optimizer':{'type':'sgd','lr':0.1}}",
     FB_ERR_WRONG_TYPE, "batch_size"},
    {"batch real", "{" DS "," MLP ",'batch_size':12.5,'steps':1,"
                   "'optimizer':{'type':'sgd','lr':0.1}}",
     FB_ERR_WRONG_TYPE, NULL},
    {"seed real", SPEC(",'seed':1e30"), FB_ERR_WRONG_TYPE, "seed"},
    {"layer not object", WITH_MODEL("'relu'"), FB_ERR_WRONG_TYPE, NULL},
    {"layers not array", "{" DS ",'model':{'input':[1,28,28],'layers':{}}," REST "}",
     FB_ERR_WRONG_TYPE, NULL},
    {"shuffle not bool", SPEC(",'data':{'shuffle':1}"), FB_ERR_WRONG_TYPE, NULL},
    {"betas wrong", "{" DS "," MLP ",'batch_size':64,'steps':100,'optimizer':{'type':'adam',"
                    "'lr':0.1,'betas':0.9}}",
     FB_ERR_WRONG_TYPE, "betas"},
    {"kernel triple", WITH_MODEL("{'type':'conv2d','out':2,'kernel':[3,3,3]}"), FB_ERR_WRONG_TYPE,
     NULL},

    /* ---- ranges ---- */
    {"batch zero", "{" DS "," MLP ",'batch_size':0,'steps':1,'optimizer':{'type':'sgd','lr':0.1}}",
     FB_ERR_OUT_OF_RANGE, "batch_size"},
    {"batch huge", "{" DS "," MLP ",'batch_size':1000000,'steps':1,"
                   "'optimizer':{'type':'sgd','lr':0.1}}",
     FB_ERR_OUT_OF_RANGE, NULL},
    {"negative lr", "{" DS "," MLP ",'batch_size':64,'steps':100,"
                    "'optimizer':{'type':'sgd','lr':-0.1}}",
     FB_ERR_OUT_OF_RANGE, "optimizer.lr"},
    {"zero lr", "{" DS "," MLP ",'batch_size':64,'steps':100,'optimizer':{'type':'sgd','lr':0}}",
     FB_ERR_OUT_OF_RANGE, NULL},
    {"beta one", "{" DS "," MLP ",'batch_size':64,'steps':100,'optimizer':{'type':'adam',"
                 "'lr':0.1,'betas':[0.9,1.0]}}",
     FB_ERR_OUT_OF_RANGE, NULL},
    {"dropout one", WITH_MODEL("{'type':'dropout','p':1.0},{'type':'flatten'},"
                               "{'type':'linear','out':10}"),
     FB_ERR_OUT_OF_RANGE, NULL},
    {"priority 101", SPEC(",'priority':101"), FB_ERR_OUT_OF_RANGE, NULL},
    /* val_fraction: a number in [0, 0.5] */
    {"val_fraction zero", SPEC(",'val_fraction':0"), FB_OK, NULL},
    {"val_fraction half", SPEC(",'val_fraction':0.5"), FB_OK, NULL},
    {"val_fraction negative", SPEC(",'val_fraction':-0.1"), FB_ERR_OUT_OF_RANGE, "val_fraction"},
    {"val_fraction above half", SPEC(",'val_fraction':0.50001"), FB_ERR_OUT_OF_RANGE,
     "val_fraction"},
    {"val_fraction one", SPEC(",'val_fraction':1"), FB_ERR_OUT_OF_RANGE, "val_fraction"},
    {"val_fraction huge", SPEC(",'val_fraction':1e300"), FB_ERR_OUT_OF_RANGE, "val_fraction"},
    {"val_fraction overflowing", SPEC(",'val_fraction':1e999"), FB_ERR_JSON_SYNTAX, NULL},
    {"val_fraction string", SPEC(",'val_fraction':'0.1'"), FB_ERR_WRONG_TYPE, "val_fraction"},
    {"val_fraction NaN string", SPEC(",'val_fraction':'NaN'"), FB_ERR_WRONG_TYPE,
     "val_fraction"},
    {"val_fraction NaN literal", SPEC(",'val_fraction':NaN"), FB_ERR_JSON_SYNTAX, NULL},
    {"val_fraction null", SPEC(",'val_fraction':null"), FB_ERR_WRONG_TYPE, "val_fraction"},
    {"val_fraction bool", SPEC(",'val_fraction':true"), FB_ERR_WRONG_TYPE, "val_fraction"},
    {"negative seed", SPEC(",'seed':-1"), FB_ERR_OUT_OF_RANGE, NULL},
    {"empty layers", "{" DS ",'model':{'input':[1,28,28],'layers':[]}," REST "}",
     FB_ERR_OUT_OF_RANGE, NULL},
    {"input 2d", "{" DS ",'model':{'input':[28,28],'layers':[{'type':'flatten'}]}," REST "}",
     FB_ERR_OUT_OF_RANGE, "model.input"},
    {"input zero", "{" DS ",'model':{'input':[0],'layers':[{'type':'linear','out':2}]}," REST "}",
     FB_ERR_OUT_OF_RANGE, NULL},
    {"pool padding", WITH_MODEL("{'type':'maxpool2d','kernel':2,'padding':2}"),
     FB_ERR_OUT_OF_RANGE, "padding"},
    {"stride zero", WITH_MODEL("{'type':'conv2d','out':2,'kernel':3,'stride':0}"),
     FB_ERR_OUT_OF_RANGE, NULL},
    {"parallel data zero", SPEC(",'parallel':{'data':0}"), FB_ERR_OUT_OF_RANGE, NULL},

    /* ---- enums and names ---- */
    {"optimizer rmsprop", "{" DS "," MLP ",'batch_size':64,'steps':100,"
                          "'optimizer':{'type':'rmsprop','lr':0.1}}",
     FB_ERR_BAD_ENUM, "rmsprop"},
    {"layer type", WITH_MODEL("{'type':'conv3d'}"), FB_ERR_BAD_ENUM, "conv3d"},
    {"loss hinge", SPEC(",'loss':'hinge'"), FB_ERR_BAD_ENUM, NULL},
    {"precision fp16", SPEC(",'precision':'fp16'"), FB_ERR_BAD_ENUM, "precision"},
    {"precision upper", SPEC(",'precision':'BF16'"), FB_ERR_BAD_ENUM, "precision"},
    {"precision number", SPEC(",'precision':16"), FB_ERR_WRONG_TYPE, "precision"},
    {"gelu fast", WITH_MODEL("{'type':'gelu','approximate':'fast'}"), FB_ERR_BAD_ENUM, NULL},
    {"name space", SPEC(",'name':'my job'"), FB_ERR_BAD_NAME, "name"},
    {"name empty", SPEC(",'name':''"), FB_ERR_BAD_NAME, NULL},
    {"dataset upper", "{'dataset':'Fashion'," MLP "," REST "}", FB_ERR_BAD_NAME, "dataset"},
    {"dataset slash", "{'dataset':'../etc'," MLP "," REST "}", FB_ERR_BAD_NAME, NULL},
    {"dataset dot", "{'dataset':'.'," MLP "," REST "}", FB_ERR_BAD_NAME, "dataset"},
    {"dataset dotdot", "{'dataset':'..'," MLP "," REST "}", FB_ERR_BAD_NAME, "dataset"},
    {"dataset hidden", "{'dataset':'.import-x'," MLP "," REST "}", FB_ERR_BAD_NAME, "dataset"},
    {"dataset dash first", "{'dataset':'-x'," MLP "," REST "}", FB_ERR_BAD_NAME, "dataset"},

    /* ---- conflicts ---- */
    {"unknown field for type", "{" DS "," MLP ",'batch_size':64,'steps':100,"
                               "'optimizer':{'type':'sgd','lr':0.1,'betas':[0.9,0.99]}}",
     FB_ERR_UNKNOWN_FIELD, "betas"},
    {"steps and epochs", SPEC(",'epochs':1"), FB_ERR_CONFLICT, NULL},
    {"nesterov no momentum", "{" DS "," MLP ",'batch_size':64,'steps':100,"
                             "'optimizer':{'type':'sgd','lr':0.1,'nesterov':true}}",
     FB_ERR_CONFLICT, "nesterov"},
    {"warmup too long", SPEC(",'schedule':{'type':'cosine','warmup_steps':100}"), FB_ERR_CONFLICT,
     "warmup_steps"},
    {"pipeline too deep", SPEC(",'parallel':{'pipeline':5}"), FB_ERR_CONFLICT, NULL},

    /* ---- shapes ---- */
    {"linear after conv", WITH_MODEL("{'type':'conv2d','out':8,'kernel':3,'padding':1},"
                                     "{'type':'linear','out':10}"),
     FB_ERR_SHAPE_MISMATCH, "model.layers[1] (linear): needs a feature input (F), got (8, 28, 28)"},
    {"conv on features", WITH_MODEL("{'type':'flatten'},{'type':'conv2d','out':2,'kernel':3}"),
     FB_ERR_SHAPE_MISMATCH, "model.layers[1]"},
    {"residual mismatch", WITH_MODEL("{'type':'residual','body':[{'type':'conv2d','out':4,"
                                     "'kernel':3}]}"),
     FB_ERR_SHAPE_MISMATCH, "(4, 26, 26)"},
    {"kernel too large", WITH_MODEL("{'type':'conv2d','out':2,'kernel':29}"),
     FB_ERR_KERNEL_TOO_LARGE, "model.layers[0]"},
    {"pool too large", WITH_MODEL("{'type':'maxpool2d','kernel':[2,30]}"),
     FB_ERR_KERNEL_TOO_LARGE, NULL},
    {"ce on images", WITH_MODEL("{'type':'relu'}"), FB_ERR_BAD_LOSS, "(1, 28, 28)"},
    {"ce one class", WITH_MODEL("{'type':'flatten'},{'type':'linear','out':1}"), FB_ERR_BAD_LOSS,
     NULL},
    {"dim too large", WITH_MODEL("{'type':'flatten'},{'type':'linear','out':1048577}"),
     FB_ERR_DIM_TOO_LARGE, NULL},
    {"input too large", "{" DS ",'model':{'input':[2097152],'layers':[{'type':'linear','out':2}]},"
                        REST "}",
     FB_ERR_DIM_TOO_LARGE, NULL},
    {"activation too large", WITH_MODEL("{'type':'conv2d','out':1048576,'kernel':1}"),
     FB_ERR_DIM_TOO_LARGE, "elements"},
    {"too many params", WITH_MODEL("{'type':'flatten'},{'type':'linear','out':1048576},"
                                   "{'type':'linear','out':10}"),
     FB_ERR_TOO_MANY_PARAMS, NULL},
    /* ---- token models ---- */
    {"char lm", TOKENS(EMB ",{'type':'positional','max_len':32}," BLOCK "," BLOCK "," LM_HEAD),
     FB_OK, NULL},
    {"token classifier", TOKENS(EMB ",{'type':'positional'}," BLOCK ",{'type':'pool','mode':'first'},"
                                "{'type':'linear','out':5}"),
     FB_OK, NULL},
    {"T beyond max_len", TOKENS(EMB ",{'type':'positional','max_len':8}," LM_HEAD),
     FB_ERR_SHAPE_MISMATCH, "max_len: 8 is below the sequence length 16"},
    {"heads not dividing dim", TOKENS(EMB ",{'type':'transformer_block','heads':5}," LM_HEAD),
     FB_ERR_SHAPE_MISMATCH, "model.layers[1].heads: 5 does not divide"},
    {"vocab 0", "{" DS ",'model':{'input':{'tokens':16,'vocab':0},'layers':[" EMB "]}," REST "}",
     FB_ERR_OUT_OF_RANGE, "model.input.vocab"},
    {"vocab too large", "{" DS ",'model':{'input':{'tokens':16,'vocab':16777217},'layers':[" EMB
                        "]}," REST "}",
     FB_ERR_OUT_OF_RANGE, "model.input.vocab"},
    {"tokens 0", "{" DS ",'model':{'input':{'tokens':0,'vocab':40},'layers':[" EMB "]}," REST "}",
     FB_ERR_OUT_OF_RANGE, "model.input.tokens"},
    {"tokens unknown field", "{" DS ",'model':{'input':{'tokens':4,'vocab':40,'dim':3},'layers':["
                             EMB "]}," REST "}",
     FB_ERR_UNKNOWN_FIELD, "model.input.dim"},
    {"embedding not first", TOKENS("{'type':'layernorm'}," EMB "," LM_HEAD),
     FB_ERR_SHAPE_MISMATCH, "needs an embedding first"},
    {"embedding twice", TOKENS(EMB "," EMB "," LM_HEAD), FB_ERR_SHAPE_MISMATCH,
     "model.layers[1] (embedding): must be the first layer"},
    {"block on features", "{" DS ",'model':{'input':[10],'layers':[" BLOCK "]}," REST "}",
     FB_ERR_SHAPE_MISMATCH, "model.layers[0] (transformer_block): needs a sequence input"},
    {"block after pool", TOKENS(EMB ",{'type':'pool'}," BLOCK ",{'type':'linear','out':3}"),
     FB_ERR_SHAPE_MISMATCH, "after the pool layer"},
    {"pool twice", TOKENS(EMB ",{'type':'pool'},{'type':'pool'},{'type':'linear','out':3}"),
     FB_ERR_SHAPE_MISMATCH, "needs a sequence input"},
    {"pool twice nested", TOKENS(EMB ",{'type':'residual','body':[{'type':'pool'}],'shortcut':"
                                 "[{'type':'pool'}]},{'type':'linear','out':3}"),
     FB_ERR_SHAPE_MISMATCH, "pools already at model.layers[1].body[0]"},
    {"embedding on image", WITH_MODEL(EMB), FB_ERR_SHAPE_MISMATCH,
     "model.layers[0] (embedding): must be the first layer, over a token input"},
    {"positional on image", WITH_MODEL("{'type':'positional'}"), FB_ERR_SHAPE_MISMATCH,
     "model.layers[0] (positional): needs a sequence input"},
    {"pool on image", WITH_MODEL("{'type':'pool'}"), FB_ERR_SHAPE_MISMATCH,
     "model.layers[0] (pool): needs a sequence input"},
    {"flatten a sequence", TOKENS(EMB ",{'type':'flatten'},{'type':'linear','out':3}"),
     FB_ERR_SHAPE_MISMATCH, "use a pool layer"},
    {"batchnorm a sequence", TOKENS(EMB ",{'type':'batchnorm'}," LM_HEAD), FB_ERR_SHAPE_MISMATCH,
     "use layernorm"},
    {"conv on a sequence", TOKENS(EMB ",{'type':'conv2d','out':3,'kernel':1}," LM_HEAD),
     FB_ERR_SHAPE_MISMATCH, "needs an image input"},
    {"lm head not vocab", TOKENS(EMB "," BLOCK ",{'type':'linear','out':39}"), FB_ERR_BAD_LOSS,
     "vocab (40) features per position"},
    {"lm with mse", TOKENS(EMB "," LM_HEAD, ",'loss':'mse'"), FB_ERR_BAD_LOSS, "cross_entropy"},
    {"block heads 0", TOKENS(EMB ",{'type':'transformer_block','heads':0}," LM_HEAD),
     FB_ERR_OUT_OF_RANGE, "model.layers[1].heads"},
    {"block mlp_ratio 17", TOKENS(EMB ",{'type':'transformer_block','heads':4,'mlp_ratio':17}," LM_HEAD),
     FB_ERR_OUT_OF_RANGE, "model.layers[1].mlp_ratio"},
    {"block dropout 1", TOKENS(EMB ",{'type':'transformer_block','heads':4,'dropout':1.0}," LM_HEAD),
     FB_ERR_OUT_OF_RANGE, "model.layers[1].dropout"},
    {"block unknown field", TOKENS(EMB ",{'type':'transformer_block','heads':4,'dim':3}," LM_HEAD),
     FB_ERR_UNKNOWN_FIELD, "model.layers[1].dim"},
    {"pool mode", TOKENS(EMB ",{'type':'pool','mode':'max'},{'type':'linear','out':3}"),
     FB_ERR_BAD_ENUM, "model.layers[1].mode"},
    {"embedding dim 0", TOKENS("{'type':'embedding','dim':0}," LM_HEAD), FB_ERR_OUT_OF_RANGE,
     "model.layers[0].dim"},
    {"attention too large",
     "{" DS ",'model':{'input':{'tokens':8192,'vocab':40},'layers':[{'type':'embedding','dim':8},"
     "{'type':'transformer_block','heads':8},{'type':'linear','out':40}]}," REST "}",
     FB_ERR_DIM_TOO_LARGE, "attention probabilities of 8 heads over 8192 positions"},
    {"token bf16", TOKENS(EMB "," LM_HEAD, ",'precision':'bf16'"), FB_ERR_UNSUPPORTED,
     "precision: bf16"},
    {"token data parallel", TOKENS(EMB "," LM_HEAD, ",'parallel':{'data':2}"), FB_ERR_UNSUPPORTED,
     "parallel"},
    {"nesting too deep",
     WITH_MODEL("{'type':'residual','body':[{'type':'residual','body':[{'type':'residual','body':"
                "[{'type':'residual','body':[{'type':'residual','body':[{'type':'relu'}]}]}]}]}]},"
                "{'type':'flatten'},{'type':'linear','out':10}"),
     FB_ERR_NESTING_TOO_DEEP, NULL},
};

/* Single quotes -> double quotes, in a malloc'd copy. */
static char *to_json(const char *s)
{
    char *j = strdup(s);
    CHECK(j);
    for (char *p = j; *p; p++)
        if (*p == '\'') *p = '"';
    return j;
}

static int parse(const char *squoted, fb_job_spec *out, char *msg, size_t msg_cap)
{
    char *j = to_json(squoted);
    int err = fb_job_spec_parse(j, strlen(j), NULL, out, msg, msg_cap);
    free(j);
    return err;
}

static void run_table(void)
{
    size_t n = sizeof cases / sizeof cases[0];
    int n_valid = 0;
    for (size_t i = 0; i < n; i++) {
        const spec_case *c = &cases[i];
        fb_job_spec spec;
        memset(&spec, 0xA5, sizeof spec);
        char msg[512] = "";
        int err = parse(c->json, &spec, msg, sizeof msg);
        printf("%-28s -> %-20s %s\n", c->name, fb_err_code(err), msg);
        if (err != c->expect) {
            fprintf(stderr, "case '%s': expected %s, got %s (%s)\n", c->name,
                    fb_err_code(c->expect), fb_err_code(err), msg);
            abort();
        }
        if (err == FB_OK) {
            n_valid++;
            CHECK(strlen(spec.fusion_key) == FB_FUSION_KEY_HEX);
            CHECK(spec.n_params > 0);
            fb_job_spec_free(&spec);
        } else {
            /* a failed parse leaves its output untouched and always explains itself */
            unsigned char *p = (unsigned char *)&spec;
            for (size_t k = 0; k < sizeof spec; k++) CHECK(p[k] == 0xA5);
            CHECK(strlen(msg) > 0);
            if (c->msg_has && !strstr(msg, c->msg_has)) {
                fprintf(stderr, "case '%s': message \"%s\" lacks \"%s\"\n", c->name, msg,
                        c->msg_has);
                abort();
            }
        }
    }
    printf("%zu spec cases (%d valid, %zu invalid)\n", n, n_valid, n - (size_t)n_valid);
    CHECK(n >= 40);
}

/* 257 layers: one over the bound, and exactly 256 accepted. */
static void run_layer_bound(void)
{
    for (int count = 256; count <= 257; count++) {
        size_t cap = (size_t)count * 24 + 512;
        char *s = malloc(cap);
        CHECK(s);
        size_t used = (size_t)snprintf(s, cap, "{" DS ",'model':{'input':[10],'layers':[");
        for (int i = 0; i < count - 1; i++) used += (size_t)snprintf(s + used, cap - used, "{'type':'relu'},");
        snprintf(s + used, cap - used, "{'type':'linear','out':3}]}," REST "}");
        fb_job_spec spec;
        char msg[256];
        int err = parse(s, &spec, msg, sizeof msg);
        if (count == 256) {
            CHECK_INT_EQ(err, FB_OK);
            CHECK_INT_EQ(spec.n_layers_total, 256);
            fb_job_spec_free(&spec);
        } else {
            CHECK_INT_EQ(err, FB_ERR_TOO_MANY_LAYERS);
        }
        free(s);
    }
}

static void key_of(const char *squoted, char key[FB_FUSION_KEY_HEX + 1], char **canon)
{
    fb_job_spec spec;
    char msg[512];
    int err = parse(squoted, &spec, msg, sizeof msg);
    if (err) fprintf(stderr, "spec failed: %s\n", msg);
    CHECK_INT_EQ(err, FB_OK);
    memcpy(key, spec.fusion_key, FB_FUSION_KEY_HEX + 1);
    if (canon) *canon = fb_job_spec_canonical(&spec);
    fb_job_spec_free(&spec);
}

#define BASE_KEYED(extra, optim, batch)                                                            \
    "{" DS "," MLP ",'batch_size':" batch ",'steps':100,'optimizer':" optim extra "}"

static void run_fusion_keys(void)
{
    char k0[40], k1[40];
    char *c0, *c1;
    const char *base = BASE_KEYED("", "{'type':'adam','lr':0.001}", "64");

    /* key order, number spelling and explicit defaults do not matter */
    key_of(base, k0, &c0);
    key_of("{'optimizer':{'lr':1e-3,'type':'adam'},'steps':100,'batch_size':64,"
           "'model':{'layers':[{'type':'flatten'},{'out':32,'type':'linear','bias':true},"
           "{'type':'relu'},{'type':'linear','out':10}],'input':[1,28,28]},"
           "'dataset':'fashion-mnist','loss':'cross_entropy','data':{'shuffle':true},"
           "'precision':'fp32','parallel':{'data':1,'pipeline':1},'priority':50}",
           k1, &c1);
    CHECK_STR_EQ(k0, k1);
    CHECK_STR_EQ(c0, c1);
    free(c1);

    /* the canonical form parses back to itself */
    key_of(c0, k1, &c1);
    CHECK_STR_EQ(k0, k1);
    CHECK_STR_EQ(c0, c1);
    free(c0);
    free(c1);

    /* init's service form is kept as written and parses back to itself */
    static const char *const inits[][2] = {
        {"'latest'", "\"init\":{\"checkpoint\":\"latest\",\"job\":"},
        {"'final'", "\"init\":{\"checkpoint\":\"final\",\"job\":"},
        {"12", "\"init\":{\"checkpoint\":12,\"job\":"},
    };
    for (size_t i = 0; i < sizeof inits / sizeof inits[0]; i++) {
        char text[1024], k2[FB_FUSION_KEY_HEX + 1];
        char *c2, *c3;
        snprintf(text, sizeof text,
                 "{" DS "," MLP ",'batch_size':64,'steps':100,'optimizer':{'type':'adam',"
                 "'lr':0.001},'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b',"
                 "'checkpoint':%s}}",
                 inits[i][0]);
        key_of(text, k2, &c2);
        CHECK(strstr(c2, inits[i][1]) != NULL);
        key_of(c2, k2, &c3);
        CHECK_STR_EQ(c2, c3);
        free(c2);
        free(c3);
    }

    /* fields that may differ inside an array */
    static const char *const same[] = {
        BASE_KEYED("", "{'type':'adam','lr':0.01,'betas':[0.5,0.9],'eps':1e-6}", "64"),
        BASE_KEYED(",'seed':99", "{'type':'adam','lr':0.001}", "64"),
        BASE_KEYED(",'name':'other','priority':7,'max_restarts':1", "{'type':'adam','lr':0.001}",
                   "64"),
        BASE_KEYED(",'schedule':{'type':'cosine','warmup_steps':10}",
                   "{'type':'adam','lr':0.001,'weight_decay':0.1}", "64"),
        BASE_KEYED(",'eval_every':10,'checkpoint_every':20,'init':'w.safetensors'",
                   "{'type':'adam','lr':0.001}", "64"),
        BASE_KEYED(",'init':{'job':'0b6e1c2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b','checkpoint':40}",
                   "{'type':'adam','lr':0.001}", "64"),
        "{" DS "," MLP ",'batch_size':64,'steps':7,'optimizer':{'type':'adam','lr':0.001}}",
        BASE_KEYED(",'val_fraction':0.1", "{'type':'adam','lr':0.001}", "64"), /* the default */
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        key_of(same[i], k1, NULL);
        if (strcmp(k0, k1) != 0) {
            fprintf(stderr, "fusible variant %zu got a different key\n", i);
            abort();
        }
    }

    /* fields that must be equal inside an array */
    static const char *const differ[] = {
        BASE_KEYED("", "{'type':'adam','lr':0.001}", "65"),
        BASE_KEYED("", "{'type':'adamw','lr':0.001}", "64"),
        BASE_KEYED(",'data_seed':1", "{'type':'adam','lr':0.001}", "64"),
        BASE_KEYED(",'data':{'shuffle':false}", "{'type':'adam','lr':0.001}", "64"),
        BASE_KEYED(",'precision':'tf32'", "{'type':'adam','lr':0.001}", "64"),
        BASE_KEYED(",'precision':'bf16'", "{'type':'adam','lr':0.001}", "64"),
        BASE_KEYED(",'parallel':{'data':2}", "{'type':'adam','lr':0.001}", "64"),
        BASE_KEYED(",'loss':'mse'", "{'type':'adam','lr':0.001}", "64"),
        /* the members of an array share minibatches: they hold out the same records */
        BASE_KEYED(",'val_fraction':0.2", "{'type':'adam','lr':0.001}", "64"),
        BASE_KEYED(",'val_fraction':0", "{'type':'adam','lr':0.001}", "64"),
        "{'dataset':'mnist'," MLP ",'batch_size':64,'steps':100,"
        "'optimizer':{'type':'adam','lr':0.001}}",
        "{" DS ",'model':{'input':[1,28,28],'layers':[{'type':'flatten'},"
        "{'type':'linear','out':33},{'type':'relu'},{'type':'linear','out':10}]},"
        "'batch_size':64,'steps':100,'optimizer':{'type':'adam','lr':0.001}}",
        "{" DS ",'model':{'input':[1,28,28],'layers':[{'type':'flatten'},"
        "{'type':'linear','out':32,'bias':false},{'type':'relu'},{'type':'linear','out':10}]},"
        "'batch_size':64,'steps':100,'optimizer':{'type':'adam','lr':0.001}}",
    };
    for (size_t i = 0; i < sizeof differ / sizeof differ[0]; i++) {
        key_of(differ[i], k1, NULL);
        if (strcmp(k0, k1) == 0) {
            fprintf(stderr, "non-fusible variant %zu got the same key\n", i);
            abort();
        }
    }
    printf("fusion keys: %zu equal, %zu different\n", sizeof same / sizeof same[0],
           sizeof differ / sizeof differ[0]);

    /* bf16 round-trips: its canonical form names it and parses back to itself,
     * and it is a key of its own (neither fp32's nor tf32's) */
    char kb[40], kt[40];
    char *cb, *cb2;
    key_of(BASE_KEYED(",'precision':'bf16'", "{'type':'adam','lr':0.001}", "64"), kb, &cb);
    CHECK(strstr(cb, "\"precision\":\"bf16\"") != NULL);
    key_of(cb, k1, &cb2);
    CHECK_STR_EQ(kb, k1);
    CHECK_STR_EQ(cb, cb2);
    key_of(BASE_KEYED(",'precision':'tf32'", "{'type':'adam','lr':0.001}", "64"), kt, NULL);
    CHECK(strcmp(kb, k0) != 0 && strcmp(kb, kt) != 0);
    fb_job_spec s;
    char msg[256];
    CHECK_INT_EQ(parse(cb, &s, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(s.precision, FB_PREC_BF16);
    fb_job_spec_free(&s);
    free(cb);
    free(cb2);
}

static void run_inference(void)
{
    fb_job_spec s;
    char msg[256];
    CHECK_INT_EQ(parse(SPEC(), &s, msg, sizeof msg), FB_OK);
    CHECK_INT_EQ(s.n_params, 784 * 32 + 32 + 32 * 10 + 10);
    CHECK_INT_EQ(s.n_layers, 4);
    CHECK_INT_EQ(s.output.ndim, 1);
    CHECK_INT_EQ(s.output.d[0], 10);
    CHECK_INT_EQ(s.layers[0].out.d[0], 784);
    CHECK_NEAR(s.layers[1].flops_fwd, 2.0 * 784 * 32, 0);
    CHECK_NEAR(s.layers[1].flops_bwd, 4.0 * 784 * 32, 0);
    CHECK(s.flops_fwd >= 2.0 * (784 * 32 + 32 * 10));
    CHECK_STR_EQ(s.name, "job");
    CHECK_INT_EQ(s.priority, 50);
    CHECK_INT_EQ(s.max_restarts, 3);
    CHECK(s.shuffle);
    fb_job_spec_free(&s);

    CHECK_INT_EQ(parse(WITH_MODEL("{'type':'conv2d','out':8,'kernel':5,'stride':2,'padding':2},"
                                  "{'type':'batchnorm'},{'type':'maxpool2d','kernel':3,'stride':2},"
                                  "{'type':'residual','body':[{'type':'conv2d','out':8,'kernel':3,"
                                  "'padding':1}]},{'type':'global_avgpool'},"
                                  "{'type':'linear','out':10}"),
                       &s, msg, sizeof msg),
                 FB_OK);
    /* conv: 28 -> (28 + 4 - 5) / 2 + 1 = 14; pool: (14 - 3) / 2 + 1 = 6 */
    CHECK_INT_EQ(s.layers[0].out.d[1], 14);
    CHECK_INT_EQ(s.layers[2].out.d[2], 6);
    CHECK_INT_EQ(s.layers[3].out.d[0], 8);
    CHECK_INT_EQ(s.layers[4].out.ndim, 1);
    CHECK_INT_EQ(s.n_params, (8 * 25 + 8) + 16 + (8 * 8 * 9 + 8) + (8 * 10 + 10));
    CHECK_NEAR(s.layers[0].flops_fwd, 2.0 * 25 * 8 * 14 * 14, 0);
    CHECK_INT_EQ(s.n_layers_total, 7);
    fb_job_spec_free(&s);

    /* a custom parameter bound */
    fb_spec_limits lim = {.max_params = 1000};
    char *j = to_json(SPEC());
    CHECK_INT_EQ(fb_job_spec_parse(j, strlen(j), &lim, &s, msg, sizeof msg),
                 FB_ERR_TOO_MANY_PARAMS);
    free(j);
}

/* Token models: shapes, parameters, the record length, canonical round trip and fusion. */
static void run_tokens(void)
{
    fb_job_spec s, r;
    char msg[512];
    const char *lm = TOKENS(EMB ",{'type':'positional','max_len':32}," BLOCK "," BLOCK "," LM_HEAD);
    CHECK_INT_EQ(parse(lm, &s, msg, sizeof msg), FB_OK);
    CHECK(s.lm);
    CHECK_INT_EQ(s.tokens, 16);
    CHECK_INT_EQ(s.vocab, 40);
    CHECK_INT_EQ(s.input.ndim, 1);
    CHECK_INT_EQ(s.input.d[0], 17); /* records of T + 1 tokens */
    CHECK_INT_EQ(s.output.ndim, 2);
    CHECK_INT_EQ(s.output.d[0], 16);
    CHECK_INT_EQ(s.output.d[1], 40);
    CHECK_INT_EQ(s.layers[0].out.ndim, 2);
    CHECK_INT_EQ(s.layers[2].causal, 1);
    CHECK_INT_EQ(s.layers[2].mlp_ratio, 4);
    int64_t D = 32, M = 128;
    int64_t block = 4 * D + 3 * D * D + 3 * D + D * D + D + D * M + M + M * D + D;
    CHECK_INT_EQ(s.n_params, 40 * D + 32 * D + 2 * block + 2 * D + D * 40 + 40);
    CHECK_NEAR(s.layers[5].flops_fwd, 2.0 * 16 * 32 * 40, 0);
    char *canon = fb_job_spec_canonical(&s);
    CHECK(canon);
    CHECK(strstr(canon, "\"input\":{\"tokens\":16,\"vocab\":40}"));
    CHECK(strstr(canon, "\"type\":\"transformer_block\""));
    CHECK_INT_EQ(fb_job_spec_parse(canon, strlen(canon), NULL, &r, msg, sizeof msg), FB_OK);
    char *canon2 = fb_job_spec_canonical(&r);
    CHECK_STR_EQ(canon, canon2);
    CHECK_STR_EQ(s.fusion_key, r.fusion_key);
    free(canon);
    free(canon2);
    fb_job_spec_free(&r);

    /* the schedule and the seed are per member; the shapes fuse */
    char k[40];
    key_of(TOKENS(EMB ",{'type':'positional','max_len':32}," BLOCK "," BLOCK "," LM_HEAD,
                  ",'schedule':{'warmup_steps':10},'seed':3"),
           k, NULL);
    CHECK_STR_EQ(k, s.fusion_key);
    key_of(TOKENS(EMB ",{'type':'positional','max_len':32}," BLOCK ","
                  "{'type':'transformer_block','heads':2}," LM_HEAD),
           k, NULL);
    CHECK(strcmp(k, s.fusion_key) != 0);
    key_of(TOKENS(EMB ",{'type':'positional','max_len':32}," BLOCK ","
                  "{'type':'transformer_block','heads':4,'causal':false}," LM_HEAD),
           k, NULL);
    CHECK(strcmp(k, s.fusion_key) != 0);
    /* a block's dropout is a layer field: one rate per array, as a dropout layer's p */
    key_of(TOKENS(EMB ",{'type':'positional','max_len':32}," BLOCK ","
                  "{'type':'transformer_block','heads':4,'dropout':0.1}," LM_HEAD),
           k, NULL);
    CHECK(strcmp(k, s.fusion_key) != 0);
    fb_job_spec_free(&s);

    /* a pool model reads records of T tokens and has a class output */
    CHECK_INT_EQ(parse(TOKENS(EMB "," BLOCK ",{'type':'pool'},{'type':'linear','out':5}"), &s, msg,
                       sizeof msg),
                 FB_OK);
    CHECK(!s.lm);
    CHECK_INT_EQ(s.input.d[0], 16);
    CHECK_INT_EQ(s.output.ndim, 1);
    CHECK_INT_EQ(s.output.d[0], 5);
    CHECK_INT_EQ(s.layers[2].pool, FB_POOL_MEAN);
    fb_job_spec_free(&s);
}

static void run_schedule(void)
{
    fb_sched_spec c = {.type = FB_SCHED_COSINE, .warmup_steps = 10};
    CHECK_NEAR(fb_sched_lr_factor(&c, 0, 110), 0.1, 1e-12);
    CHECK_NEAR(fb_sched_lr_factor(&c, 9, 110), 1.0, 1e-12);
    CHECK_NEAR(fb_sched_lr_factor(&c, 10, 110), 1.0, 1e-12);
    CHECK_NEAR(fb_sched_lr_factor(&c, 60, 110), 0.5, 1e-12);
    CHECK_NEAR(fb_sched_lr_factor(&c, 110, 110), 0.0, 1e-12);
    fb_sched_spec st = {.type = FB_SCHED_STEP, .step_size = 3, .gamma = 0.5};
    CHECK_NEAR(fb_sched_lr_factor(&st, 2, 100), 1.0, 1e-12);
    CHECK_NEAR(fb_sched_lr_factor(&st, 3, 100), 0.5, 1e-12);
    CHECK_NEAR(fb_sched_lr_factor(&st, 7, 100), 0.25, 1e-12);
    fb_sched_spec k = {.type = FB_SCHED_CONSTANT};
    CHECK_NEAR(fb_sched_lr_factor(&k, 5, 100), 1.0, 0);
}

static void run_load(void)
{
    fb_job_spec s;
    char msg[512];
    CHECK_INT_EQ(fb_job_spec_load("/nonexistent/spec.json", NULL, &s, msg, sizeof msg),
                 FB_ERR_IO);
    CHECK(strstr(msg, "/nonexistent/spec.json"));
    /* a huge body is refused before parsing */
    size_t big = (2u << 20);
    char *buf = malloc(big);
    CHECK(buf);
    memset(buf, ' ', big);
    CHECK_INT_EQ(fb_job_spec_parse(buf, big, NULL, &s, msg, sizeof msg), FB_ERR_OUT_OF_RANGE);
    free(buf);
    /* text with an embedded NUL in a string value */
    static const char nul[] = "{\"name\":\"a\\u0000b\"}";
    CHECK(fb_job_spec_parse(nul, sizeof nul - 1, NULL, &s, msg, sizeof msg) < 0);
    /* NULL message buffer is allowed */
    CHECK_INT_EQ(fb_job_spec_parse("[]", 2, NULL, &s, NULL, 0), FB_ERR_NOT_OBJECT);
    fb_job_spec_free(NULL);
}

/* val_fraction's default, and its place in the canonical form */
static void run_val_fraction(void)
{
    fb_job_spec spec;
    char msg[512];
    CHECK_INT_EQ(parse(SPEC(), &spec, msg, sizeof msg), FB_OK);
    CHECK(spec.val_fraction == FB_SPEC_DEFAULT_VAL_FRACTION && spec.val_fraction == 0.1);
    char *c = fb_job_spec_canonical(&spec);
    CHECK(c && strstr(c, "\"val_fraction\":0.1"));
    free(c);
    fb_job_spec_free(&spec);
    CHECK_INT_EQ(parse(SPEC(",'val_fraction':0.25"), &spec, msg, sizeof msg), FB_OK);
    CHECK(spec.val_fraction == 0.25);
    c = fb_job_spec_fusion_canonical(&spec);
    CHECK(c && strstr(c, "\"val_fraction\":0.25"));
    free(c);
    fb_job_spec_free(&spec);
    /* none held out: the fusion key's canonical form is the one jobs accepted before
     * validation existed have (their checkpoints carry that key) */
    CHECK_INT_EQ(parse(SPEC(",'val_fraction':0"), &spec, msg, sizeof msg), FB_OK);
    c = fb_job_spec_fusion_canonical(&spec);
    CHECK(c && !strstr(c, "val_fraction") && strstr(c, "\"precision\":\"fp32\"}"));
    free(c);
    c = fb_job_spec_canonical(&spec);
    CHECK(c && strstr(c, "\"val_fraction\":0"));
    free(c);
    fb_job_spec_free(&spec);
    printf("val_fraction: default and explicit values, the fusion key without it at 0\n");
}

int main(void)
{
    run_table();
    run_val_fraction();
    run_layer_bound();
    run_fusion_keys();
    run_inference();
    run_tokens();
    run_schedule();
    run_load();
    printf("jobspec: all checks passed\n");
    return 0;
}
