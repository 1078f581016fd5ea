def top():
    return 1

class Klass:
    def meth(self):
        x = 1
        return x

    @staticmethod
    def meth2():
        return 2
